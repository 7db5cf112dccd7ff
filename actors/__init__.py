"""waferrt.actors: the only Ray and pyzmq code. TileActor hosts a tile's cores; the fabric links tiles."""
