"""Command-line tools: ``aioccl-perf`` (nccl-tests equivalent). The launcher is ``aioccl.run``."""
