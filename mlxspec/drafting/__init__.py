"""Drafters: a draft model, prompt lookup, Medusa heads and feature heads (EAGLE, MTP), wired by factory.make_drafter."""
