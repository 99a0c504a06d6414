"""The target model's ranks: one rank's state (ModelShard) and the groups that drive ranks."""
