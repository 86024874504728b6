"""The decode loop: propose -> verify (one target forward) -> accept -> commit."""
