CREATE OR REPLACE PROCEDURE runbatches(stmt text, n int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    EXECUTE stmt;
    COMMIT;
  END LOOP;
END $$;
