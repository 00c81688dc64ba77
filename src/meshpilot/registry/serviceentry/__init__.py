"""The ServiceEntry registry: ServiceEntries and the WorkloadEntries they select."""
