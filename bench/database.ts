import pg from 'pg';

/** Drops and creates the database a benchmark works in (named by the URL's path), through the server's `postgres` database. */
export async function recreateDatabase(databaseUrl: string): Promise<string> {
  const admin = new pg.Client({ connectionString: databaseUrl.replace(/\/[^/]+$/, '/postgres') });
  const name = new URL(databaseUrl).pathname.slice(1);
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  return name;
}
