"""The transport: frames, connections, the job handshake, the dispatch
table, message structs and value codecs.  It imports nothing of meshio but
its errors and constants; the layers above register handlers with it
(:func:`._runtime.register_handler`)."""
