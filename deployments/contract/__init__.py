"""The vocabulary every layer shares, at the bottom of the house.

Keys and the action scripts that hold them, start-image kinds, the block
timeline, the interactions a user sends mid-stream and the `SessionSpec` a
session's request resolves to. The protocol (which parses the
wire into these) and the engine (which runs them) both import from here and
never from each other. Pure Python and numpy: no pydantic, torch, Ray or sockets.
"""
