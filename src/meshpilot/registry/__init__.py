"""Service registries: where services and endpoints come from."""
