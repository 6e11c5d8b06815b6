"""Small widgets shared by every area (message bar, sections, card and folder dialogs)."""
