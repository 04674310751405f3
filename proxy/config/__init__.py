"""The YAML file -> frozen, typed config objects, parsed once; every error names its path.

May import: proxy.errors and policies (the specs policies take). Nothing else of ours:
everything else imports config, so config imports nothing above it.
"""
