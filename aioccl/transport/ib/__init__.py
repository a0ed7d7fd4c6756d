"""RDMA (InfiniBand / RoCE) transport: see README.md in this folder."""
