"""The process's own plumbing: how it ends, what it hides from stderr, framework import guards, the
compilation cache, CPU emulation."""
