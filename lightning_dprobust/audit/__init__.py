"""Privacy audits: membership-inference attacks (loss threshold, shadow models, LiRA), one-run canary audits, and the
retraining they need."""
