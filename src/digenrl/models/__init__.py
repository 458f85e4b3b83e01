"""Policy adapters: the built-in tiny DiT and the diffusers transformer families, behind one interface."""
