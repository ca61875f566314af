-- Device credentials (docs/security.md, "Expiry"): the id of the device
-- token that authenticated the device's last connection, so that a token in
-- use is still renewed after a restart; '' when none is known.
ALTER TABLE devices ADD COLUMN token_id TEXT NOT NULL DEFAULT '';
