"""The Analysis area: the probe's charts, heat maps, inspection views, the tensor table, chart export."""
