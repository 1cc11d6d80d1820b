"""One view (a widget) per module; each has ``show(snapshot)``."""
