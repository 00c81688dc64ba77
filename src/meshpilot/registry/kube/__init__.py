"""The Kubernetes registry: Services, EndpointSlices, Pods, Nodes and Namespaces."""
