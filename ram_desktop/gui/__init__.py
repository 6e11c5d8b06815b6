"""The desktop face of RAM Desktop (PySide6 + pyqtgraph). Calls ``ram_desktop.core`` only."""
