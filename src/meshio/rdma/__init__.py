"""One-sided RDMA buffers.  Filled in by the RDMA work."""

__all__ = ()
