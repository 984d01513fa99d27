"""Task sets: generators, bundled sets and loaders for real datasets, behind one interface."""
