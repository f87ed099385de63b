"""Types every layer shares (warmup results, progress events, failure classification, phase
names, statistics); they import nothing of warmgate, so anything may import them."""
