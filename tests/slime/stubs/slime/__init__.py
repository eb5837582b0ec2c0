"""Stand-in for THUDM/slime: only the names and signatures cwtrain plugs into (never slime's code)."""
