"""OAuth 2.1 through the proxy: discovery on the proxy's origin, tokens, and who the caller is."""
