"""AutoMDT: modular data transfers jointly tuned by a reinforcement-learning agent."""

__version__ = "0.1.0"
