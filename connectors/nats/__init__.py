"""The NATS JetStream sink: publishing with acknowledgements, one partition per key range."""
