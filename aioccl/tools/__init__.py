"""Command-line tools: ``aioccl-perf`` (nccl-tests equivalent). The launcher is :mod:`aioccl.run`."""
