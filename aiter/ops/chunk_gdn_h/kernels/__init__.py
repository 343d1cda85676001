"""chunk_gdn_h's kernel side: the index arithmetic the kernel and the CPU emulation share."""
