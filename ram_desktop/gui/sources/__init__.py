"""The Sources area: the base and agents table and the Hub dialog."""
