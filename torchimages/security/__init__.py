"""Security of what we publish: OS fixes the security archive has (freshness), the SBOM and scan gate, OpenVEX, and
the patch promise."""
