"""The metric taxonomy, batch statistics, sinks and readers, the plot of a run."""
