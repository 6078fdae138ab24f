"""What the tests share: the clients of the proxy, the scripted upstreams, the real peers and processes,
and the checks every suite applies (tests/README.md lists them)."""
