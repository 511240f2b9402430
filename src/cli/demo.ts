/** `parley demo`: seed (or renew) the demo organisation and print how to sign in. */
import { loginHint } from '../app.js';
import { publicBaseUrl } from '../config/index.js';
import { seedDemo } from '../demo/demo.js';
import { withDatabase } from './database.js';

export const demo = (o: { json?: boolean }) =>
  withDatabase(!!o.json, async (db, records, config) => {
    const seeded = await seedDemo(db, records);
    return {
      result: { id: seeded.organisation_id, ...seeded },
      text: loginHint(publicBaseUrl(config), seeded),
    };
  });
