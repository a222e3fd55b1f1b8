"""Tools for testing rockstate and the pipelines that use it."""
