"""DFlash block drafters: the model, its files and the drafter (chains and DDTrees)."""
