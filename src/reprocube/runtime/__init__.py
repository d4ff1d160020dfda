"""The process's own plumbing: how it ends, what it hides from stderr, framework import guards, entries
imported only when asked for (the registry), the compilation cache, CPU emulation."""
