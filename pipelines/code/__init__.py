"""Code corpus: crawl (registries + git), language ID and metadata fix, per-language quality scores."""
