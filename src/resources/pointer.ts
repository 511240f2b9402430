/** The JSON:API error source of a request body's attribute `name`. */
export const at = (name: string) => ({ pointer: `/data/attributes/${name}` });
