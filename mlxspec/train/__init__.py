"""Training feature heads (EAGLE) and Medusa heads by self-distillation from the target."""
