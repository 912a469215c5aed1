"""The keyboard keys a client may hold in `multi_modal_data.actions` (PROTOCOL.md): w a s d move, i j k l look."""

MOVE_KEYS = ("w", "a", "s", "d")
LOOK_KEYS = ("i", "j", "k", "l")
KEYS = frozenset(MOVE_KEYS + LOOK_KEYS)
