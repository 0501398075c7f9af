package store

// ClaimSQL lets the external tests look at the claim's plan.
const ClaimSQL = claimSQL
