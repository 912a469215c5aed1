"""Media on the client side: reading video files to stream, decoding the fMP4 a server streams back."""
