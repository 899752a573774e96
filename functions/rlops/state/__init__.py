"""What rlops keeps in the environment's state bucket: locks and the record of what it owns."""
