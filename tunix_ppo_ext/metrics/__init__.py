"""Metrics: the key taxonomy (`keys`), batch statistics (`stats`), sinks and readers
(`sinks`), and the plot of a run (`plot`)."""
