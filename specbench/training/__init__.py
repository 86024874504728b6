"""Drafter training by self-distillation from the target (the DeepSpec / SpecForge flow)."""
