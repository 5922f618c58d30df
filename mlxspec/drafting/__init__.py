"""Drafters: a draft model, prompt lookup, Medusa heads and feature heads (EAGLE, MTP); see factory.py."""
