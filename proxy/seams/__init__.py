"""Where the proxy joins its dependencies below their public API (docs/design.md §Seams): each
dependency's private parts named in one module of this package, with a check of the shape relied
on. `supported.refusal()` is the start-up's verdict on them."""
