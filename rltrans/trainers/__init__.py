"""Trainers: one function per learner, each reading top to bottom over the run context."""
