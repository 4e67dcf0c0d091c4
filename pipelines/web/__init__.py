"""Web corpus: crawl or ingest WARC snapshots, extract text, filter for quality."""
