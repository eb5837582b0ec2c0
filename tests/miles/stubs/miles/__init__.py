"""Stand-in for radixark/miles: only the names and signatures cwtrain plugs into (never miles code)."""
