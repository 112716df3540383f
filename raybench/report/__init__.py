"""The report floor: what a finished sweep or benchmark says, from its typed records (raybench.records) and
its files. Results tables and pages (results, results_text), comparisons across sweeps (compare, with stats for
their statistics), each page a document (document) that every output format writes (renderers, the formats'
registry), figures (plots), hyperparameter importance (importance) and the end-of-sweep record a sweep
writes (record). It sits above raybench.sweep and never imports the Ray adapter: a report can be made on a
machine that never started Ray."""
