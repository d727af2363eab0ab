"""The training step every stage takes (`step`) and the offline stages' loop around it (`fit`)."""
