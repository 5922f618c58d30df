"""Drafts with a smaller model of another tokenizer: the drafter and the vocabulary bridge."""
