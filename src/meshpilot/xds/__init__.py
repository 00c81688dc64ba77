"""The ADS server: connections, ACK/NACK, generators, the push queue."""
