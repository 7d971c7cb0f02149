"""The acting runtime: one episode loop for rollouts, evaluation and collection; actors."""
