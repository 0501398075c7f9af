-- 0008: reserved. Another change of issue 14 owns this number; this
-- placeholder only keeps the versions contiguous so that 0009 applies on a
-- branch without it, and is replaced by that migration when both merge.
SELECT 1;
