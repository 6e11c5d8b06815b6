"""The Merge and Result steps: Analyze / Merge / Cancel with progress and log, and the merged model."""
